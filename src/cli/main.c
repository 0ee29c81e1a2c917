/* The kiln command-line tool: command dispatch, help texts, and `kiln info`. Each command lives
 * in its own file (run.c, bench.c) and returns an exit code: 0 ok, 1 a kiln call failed, 2 a
 * usage error. Must never abort or crash on user input. */
#include <string.h>

#include "cli/cli.h"
#include "sched/backend.h"

bool kiln_cli_quiet;

static const char usage_main[] =
    "usage: kiln COMMAND [FLAGS]\n"
    "\n"
    "kiln runs transformer graphs with op fusion on the best backend present.\n"
    "\n"
    "commands:\n"
    "  info [MODEL.gguf]     version, backends (available or why not), CPU ISA, threads; or a model\n"
    "  generate MODEL.gguf -p TEXT   tokenize, prefill, then sample and stream tokens\n"
    "  run FILE.kg           run a .kg graph on random inputs, print output checksums\n"
    "  bench --preset NAME | --model MODEL.gguf   time decode or prefill of a preset or a model\n"
    "  plan FILE.kg | MODEL.gguf | --preset NAME   fused kernels, placement and predicted costs\n"
    "  spirv FILE.kg | --preset NAME  the Vulkan backend's GLSL (or SPIR-V) of each fused kernel\n"
    "  ptx FILE.kg | --preset NAME    generated PTX per fused kernel, ptxas registers/spills\n"
    "  check                 every op x dtype x backend against the f64 reference\n"
    "  calibrate             measure bandwidth and FLOP/s of each backend for the cost model\n"
    "  cache ls|stats|clear  the kernel cache folder: entries, sizes, hit/miss counts; remove them\n"
    "  help [COMMAND]        this text, or a command's flags\n"
    "\n"
    "`kiln COMMAND --help` shows a command's flags. Exit codes: 0 ok, 1 a kiln call failed,\n"
    "2 a usage error.\n"
    "--quiet (any command): no progress lines on stderr. Progress lines (compiles, model loading,\n"
    "prefill past 2 s) show only on a terminal; KILN_PROGRESS=0|1 never|always.\n";

static const char usage_info[] =
    "usage: kiln info [MODEL.gguf] [--json]\n"
    "\n"
    "Prints kiln's version, every backend kiln knows with whether it is available here (its\n"
    "device/ISA, or why not), the CPU ISA path in use and the CPU thread count.\n"
    "With MODEL.gguf: the file's architecture, sizes, tensor types (and which kiln cannot run), and\n"
    "the backend and kernel count kiln would run a decode step with.\n"
    "  --json   one JSON object instead of text\n";

static const char usage_generate[] =
    "usage: kiln generate MODEL.gguf (-p TEXT | -f FILE | --ids 1,2,3) [-n N] [--chat [--system TEXT]]\n"
    "                     [--temp T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R]\n"
    "                     [--repeat-last-n N] [--seed S] [--stop STRING]... [--logits FILE]\n"
    "                     [--ignore-eos] [--profile] [--backend B] [--gpus N] [--threads N] [--json]\n"
    "\n"
    "Loads a GGUF model (weights used in place from the mapping; kiln info MODEL.gguf says whether\n"
    "kiln runs it), tokenizes the prompt with the file's own tokenizer (tokenizer.ggml.*: SentencePiece\n"
    "or byte-level BPE), prefills it in one run, then decodes one token per run of the same compiled\n"
    "plan, sampling each and printing its text to stdout as it comes. Stops at an end-of-generation\n"
    "token, a --stop string or after N tokens. A closing line on stderr gives prompt and generation\n"
    "tokens/s and the seed. KV cache f16.\n"
    "  -p TEXT          the prompt (special tokens written in it, like <|im_start|>, are parsed; BOS\n"
    "                   is added when the file says so)\n"
    "  -f FILE          the prompt from a file (as -p)\n"
    "  --ids LIST       prompt token ids instead (each below the vocabulary size); without a usable\n"
    "                   tokenizer the generated ids are printed instead of text\n"
    "  -n N             tokens to generate (default 128, or what the context leaves)\n"
    "  --chat           put -p through the model's chat template (tokenizer.chat_template): llama-3,\n"
    "                   chatml (qwen), gemma and mistral/llama-2 [INST] families; others are refused\n"
    "  --system TEXT    a system message for --chat\n"
    "  --temp T         temperature (default 0.8; 0: greedy, the argmax after the penalty)\n"
    "  --top-k K        keep the K most likely tokens (default 40, 0: all)\n"
    "  --top-p P        keep the smallest set reaching probability P (default 0.95, 1: all)\n"
    "  --min-p P        drop tokens below P times the most likely one (default 0.05, 0: none)\n"
    "  --repeat-penalty R   on the last --repeat-last-n tokens (default 1.0: off; 64 tokens)\n"
    "  --seed S         of the sampler (default: from the clock; printed on the closing line)\n"
    "  --stop STRING    stop when the text contains STRING (cut off; up to 8 of them)\n"
    "  --logits FILE    write the raw logits each token was drawn from: n_vocab f32 per token\n"
    "  --ignore-eos     do not stop at end-of-generation tokens (always N tokens: for timing)\n"
    "  --profile        where a decode step's time goes, on stderr (with --json: a \"profile\" member):\n"
    "                   host ms a step in the run (bindings, launch or replay, waiting for the device),\n"
    "                   sampling and text; recordings made and replayed; then the last step run again\n"
    "                   8 times kernel by kernel: the kernels' device time a step, by kind of kernel\n"
    "  --backend B      auto (default), ref, cpu, cuda, vulkan\n"
    "  --gpus N         split the model over N GPUs (cuda:0..N-1; with --backend cpu or ref, N virtual\n"
    "                   devices): tensor parallelism, layers Megatron-style, the head by vocabulary or\n"
    "                   replicated as the cost model chooses (kiln plan --devices explains the split)\n"
    "  --threads N      CPU threads (default: one per core)\n"
    "  --json           print only {\"ids\", \"text\", \"prompt_tokens\", \"prefill_tok_s\", \"decode_tok_s\",\n"
    "                   \"ms_per_token\", \"stop\", \"seed\", \"backend\", \"devices\"[, \"profile\"]} at the end\n";

/* Shared by run.c and bench.c through kiln_cli_usage(). */
static const char usage_run[] =
    "usage: kiln run FILE.kg [--backend B] [--devices D] [--set SYM=N]... [--seed N] [--threads N]\n"
    "                [--no-fuse] [--check-finite] [--json]\n"
    "\n"
    "Compiles FILE.kg, fills its inputs with reproducible random data, runs it once and prints\n"
    "each output's dtype, shape and checksums (sum and sum of |x|, in f64).\n"
    "  --backend B   auto (default), ref, cpu, cuda, vulkan\n"
    "  --devices D   split the graph over devices (tensor parallelism): \"cpu:0,1\", \"cuda:0,0\" (virtual\n"
    "                parts on one GPU), or a count on --backend\n"
    "  --set SYM=N   value of a symbolic dim (default: its maximum)\n"
    "  --seed N      random seed of the inputs (default 1). Float inputs are uniform in [-1, 1).\n"
    "                i32 inputs: ids of a get_rows get 0..rows-1; positions read by kv_scatter or\n"
    "                rope get n_kv-n_tok..n_kv-1 (the attention convention), else 0..n-1;\n"
    "                others get 0..99. A paged_attention's step: n_tok tokens split over n_seq\n"
    "                sequences, each prefilling from an empty cache into its own blocks\n"
    "                (positions, starts and lengths, block table and slots made to agree); with\n"
    "                parents, each sequence's tokens a binary tree of drafts\n"
    "  --threads N   CPU threads (default: one per core)\n"
    "  --no-fuse     one kernel per op\n"
    "  --check-finite  fail (exit 1) at the first kernel that stores a NaN or infinity, naming the node\n"
    "  --json        one JSON object instead of text\n";

static const char usage_bench[] =
    "usage: kiln bench --model MODEL.gguf [--mode decode|prefill] [--steps S] [--ctx N] [--tokens T]\n"
    "                  [--backend B] [--threads N] [--moe-dense] [--profile] [--json]\n"
    "       kiln bench --preset NAME [--mode decode|prefill] [--layers N] [--steps S] [--ctx N]\n"
    "                  [--tokens T] [--backend B] [--wtype f32|f16|q8_0|q4_k] [--threads N]\n"
    "                  [--seed N] [--precision exact|f16] [--profile] [--no-roof] [--check-finite]\n"
    "                  [--host-io] [--gpus N] [--json]\n"
    "\n"
    "--model: times a GGUF model's whole decode step (S steps of one token from KV length --ctx,\n"
    "default 256; 16 steps) or prefill (S runs of --tokens, default 128; 4 steps): median ms/step,\n"
    "tok/s, and GB/s of weights read (of a mixture of experts, the routed experts' share of the\n"
    "stacks: k of E per token; --moe-dense: every expert on every token, the A/B baseline).\n"
    "--preset: builds NAME's decoder layers with random weights and times them.\n"
    "  --preset NAME   qwen2-0.5b, llama-7b, qwen2-7b, llama-70b\n"
    "  --mode M        decode (default): S steps of one token over a KV cache growing from --ctx;\n"
    "                  prefill: S runs of T tokens from position 0\n"
    "  --layers N      layers (default: 1 on ref, else enough that weights exceed 2x the L3)\n"
    "  --steps S       timed steps (default 32 decode, 4 prefill; 8 and 2 on ref)\n"
    "  --ctx N         KV rows before the first decode step (default 1024; 128 on ref)\n"
    "  --tokens T      prefill tokens (default 256; 32 on ref)\n"
    "  --backend B     auto (default: the best present), ref, cpu, cuda, vulkan\n"
    "  --wtype T       matmul weight dtype (default q8_0); KV cache f32 for f32, else f16\n"
    "  --threads N     CPU threads (default: one per core)\n"
    "  --seed N        seed of the random weights and inputs (default 1)\n"
    "  --precision P   exact (default; $KILN_PRECISION): GEMMs and flash attention keep f32 activations\n"
    "                  exact (two f16 parts); f16: one f16 part, as PyTorch and llama.cpp run f16 layers\n"
    "                  (codegen.precision; contracts' tolerance_f16_act)\n"
    "  --profile       per kernel: predicted vs measured time (on the device where it has timers), achieved\n"
    "                  GB/s (cost-model bytes / time), roofline bound; with --json a \"profile\" object\n"
    "  --no-roof       do not measure the machine's bandwidth and FMA peak after the run\n"
    "  --check-finite  the NaN/Inf guard on (every kernel's outputs scanned): to measure its cost\n"
    "  --host-io       on cuda, x and y in host memory (copied in and out every step); by default they\n"
    "                  stay in device memory, as the activations of a layer stack inside an engine do\n"
    "  --gpus N        N > 1: the layers split over cuda:0..N-1 (tensor parallelism through NCCL; x and y\n"
    "                  in host memory); 1: on cuda alone (compare with --host-io)\n"
    "  --json          one JSON object (no progress line)\n"
    "Prints the median ms per layer-step and GB/s = (weight + KV bytes read) / time, and that as a\n"
    "fraction of the read bandwidth (and FMA peak) measured in the same run.\n"
    "\n"
    "       kiln bench --preset NAME --mode serve [--seqs N] [--ctx C] [--ragged] [--block B] [--chunk P]\n"
    "                  [--layers N] [--steps S] [--wtype T] [--kv T] [--backend B] [--seed N] [--host]\n"
    "                  [--only decode|mixed] [--profile] [--json]\n"
    "--mode serve: the layers with paged attention (blocks shuffled over the pool), as an engine runs\n"
    "them: steady-state decode of N sequences (default 16) at KV length C (default 1024; --ragged:\n"
    "lengths spread over C/2..3C/2, same total), one token each per step; then a mixed step of a\n"
    "P-token prefill chunk (default 512; 0: none) plus N - 1 decoding sequences, with its time split\n"
    "between matmul and attention kernels (profiled). --block B tokens per block (default 16),\n"
    "--layers (default 4; 1 on ref), --wtype (default f16), --kv the pools' dtype (f16; f32 with f32\n"
    "weights; q8_0: ggml's blocks, quantized by kv_scatter). On cuda x and y stay in device memory.\n"
    "--only decode|mixed times one of the two (under a profiler); --profile adds the per-kernel table\n"
    "(predicted vs measured) of S profiled decode steps (with --json, a \"profile\" object).\n"
    "--host (cuda): instead, the host time of each kiln_run_async call (median, p90, max us) over S\n"
    "decode steps (default 160) of a captured graph with every input, output and metadata buffer bound\n"
    "as device memory, --layers default 32: the per-step overhead an engine pays on its stream.\n";

static const char usage_plan[] =
    "usage: kiln plan (FILE.kg | MODEL.gguf | --preset NAME [--wtype T]) [--layers N] [--ctx N] [--tokens T]\n"
    "                 [--backend B] [--devices D] [--no-fuse] [--profile FILE] [--what-if] [--json | --dot]\n"
    "                 [--svg FILE]\n"
    "\n"
    "Shows how kiln compiles a graph: each fused kernel with its ops, the backend it runs on, its\n"
    "FLOPs and bytes, whether memory or compute bounds it, and its predicted time on every backend\n"
    "(roofline: max(flops / peak, bytes / bandwidth) + launch). Sizes are the symbols' bounds.\n"
    "  --preset NAME   a model preset instead of a file (decode: --tokens 1, n_kv bound --ctx 1024)\n"
    "  MODEL.gguf      a llama/qwen2 GGUF model's decoder (all layers unless --layers; f16 KV)\n"
    "  --backend B     force one backend (default: placement chooses per kernel)\n"
    "  --devices D     split the graph over devices (tensor parallelism: \"cpu:0,1\", \"cuda:0,1\", or a count\n"
    "                  on --backend): the split is shown first, then the kernels of one part\n"
    "  --no-fuse       one kernel per op\n"
    "  --profile FILE  JSON device profiles overriding the measured ones (cost-model experiments)\n"
    "  --what-if       also place on backends absent here that --profile FILE describes (needs --profile)\n"
    "  --json, --dot   JSON, or a Graphviz graph of the fused kernels (kiln plan ... --dot | dot -Tpng)\n"
    "  --svg FILE      also write the roofline of each backend used (profile: bandwidth, f32 peak) with\n"
    "                  every kernel at its FLOP/byte and predicted FLOP/s, as SVG\n";

static const char usage_spirv[] =
    "usage: kiln spirv (FILE.kg | --preset NAME [--wtype T] [--ctx N] [--tokens T]) [--no-fuse]\n"
    "                  [--disasm] [--features none|all]\n"
    "\n"
    "Prints the GLSL compute shader the Vulkan backend generates for each fused kernel (lowered to\n"
    "kir first; kernels without a template say why). Needs no device.\n"
    "  --disasm          the SPIR-V disassembly instead (compiled with glslang; needs spirv-dis)\n"
    "  --features F      none: portable fallbacks (default); all: 16-bit stores, subgroup (32)\n"
    "                    reductions and integer dot products, as on a device that has them\n"
    "  --no-fuse         one kernel per op\n";
static const char usage_ptx[] =
    "usage: kiln ptx (FILE.kg | --preset NAME [--wtype T] [--tokens T] [--ctx N]) [--sm 80|90]\n"
    "                [--region I] [--no-fuse] [--kir] [--summary] [--json]\n"
    "\n"
    "Prints the PTX the CUDA backend generates for each fused region (kernel), and, when ptxas is\n"
    "found ($KILN_PTXAS, PATH, /usr/local/cuda/bin), its report: registers, spill bytes, stack and\n"
    "shared memory. Each kernel also gets a static summary: global loads and stores by width,\n"
    "read-only (.nc) and in-loop loads, shared-memory traffic, barriers, shuffles, loops.\n"
    "Regions the lowering does not take yet are listed with the reason. Needs no GPU.\n"
    "  --preset NAME   one layer of a model preset (qwen2-0.5b, llama-7b, qwen2-7b, llama-70b)\n"
    "  --wtype T       matmul weight dtype: f32, f16, q8_0 (default), q4_k\n"
    "  --tokens T      bound of n_tok: 1 (default) is decode, more is prefill\n"
    "  --ctx N         bound of n_kv (default 4096)\n"
    "  --sm 80|90      PTX target (default 90)\n"
    "  --region I      only region I\n"
    "  --no-fuse       one kernel per op\n"
    "  --kir           also the lowered kernel (kir) listing before each kernel's PTX\n"
    "  --summary       reports only, no PTX text\n"
    "  --json          one JSON object\n"
    "Exit code 1 when a kernel fails to print or to assemble.\n";

static const char usage_calibrate[] =
    "usage: kiln calibrate [--json] [--no-save]\n"
    "\n"
    "Measures each available backend (cpu: streaming read bandwidth and FMA peak over all threads)\n"
    "and stores the profiles in the cache dir ($KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln), where\n"
    "placement and kiln plan find them. With two or more GPUs and NCCL, also the all-reduce between\n"
    "them (latency at 8 KB, bus bandwidth at 16 MiB: the cuda profile's link_latency_s and link_bw,\n"
    "which the tensor-parallel split's cost model weighs); otherwise it says why that was skipped.\n";

static const char usage_check[] =
    "usage: kiln check [--backend B] [--op NAME] [--quick] [--seed N] [--threads N] [--failures]\n"
    "                  [--json]\n"
    "\n"
    "Checks every op x dtype on every available backend against kiln's f64 reference: >= 40\n"
    "shapes per op x dtype (1, odd, prime, large, symbolic dims at several values), fresh random\n"
    "data, outputs poisoned and guarded; NMSE within the contract's tolerance (contracts/*.yaml),\n"
    "no NaN, infinities matching. Also fused patterns, preset decode/prefill layers, fused vs\n"
    "unfused, and determinism (10 runs bit-identical). Exit 0 all passed, 1 a failure.\n"
    "  --backend B   one backend (default: every available one)\n"
    "  --op NAME     one op (matmul, rope, ...; attention:masks, paged_attention:masks: the soft-cap and window\n"
    "                cases alone) or group (fused, preset, determinism)\n"
    "  --quick       12 cases per op x dtype and a small preset layer (CI)\n"
    "  --seed N      data seed (default: from the clock; printed, to replay a failure)\n"
    "  --threads N   CPU threads (default: one per core)\n"
    "  --failures    print only failing rows\n"
    "  --json        {\"ok\": bool, \"results\": [{\"op\", \"dtype\", \"backend\", \"cases\",\n"
    "                \"worst_nmse\", \"tolerance\", \"ok\"}]}\n";

static const char usage_cache[] =
    "usage: kiln cache ls|stats|clear [--json]\n"
    "\n"
    "The kernel and plan cache folder ($KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else\n"
    "~/.cache/kiln): one file per compiled kernel (cuda: PTX and cubin; vk: SPIR-V; cpu: dispatch\n"
    "decisions, written with KILN_CACHE=all only), each checked (header, key, checksums) before use.\n"
    "  ls      every entry: file, kind, bytes, and what is wrong with an invalid one; then totals\n"
    "  stats   totals, and the hit/miss counts every kiln process added up in the folder\n"
    "  clear   remove every entry, temporary file and the counts\n"
    "  --json  one JSON object\n"
    "KILN_CACHE=off turns the disk entries off (plans still share compiled code in memory).\n"
    "KILN_CACHE_MAX=SIZE bounds the folder (default 512M; 0: no bound): past it, the entries used\n"
    "longest ago are removed.\n";

static const struct {
    const char *name;                     /* command name */
    int (*fn)(int argc, char *const *argv); /* entry point */
    const char *usage;                    /* --help text */
} commands[] = {
    {"info", kiln_cli_info, usage_info},
    {"generate", kiln_cli_generate, usage_generate},
    {"run", kiln_cli_run, usage_run},
    {"bench", kiln_cli_bench, usage_bench},
    {"plan", kiln_cli_plan, usage_plan},
    {"spirv", kiln_cli_spirv, usage_spirv},
    {"ptx", kiln_cli_ptx, usage_ptx},
    {"calibrate", kiln_cli_calibrate, usage_calibrate},
    {"check", kiln_cli_check, usage_check},
    {"cache", kiln_cli_cache, usage_cache},
};
#define N_COMMANDS (int)(sizeof commands / sizeof commands[0])

bool kiln_cli_wants_help(int argc, char *const *argv, const char *cmd)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            for (int c = 0; c < N_COMMANDS; c++)
                if (strcmp(commands[c].name, cmd) == 0)
                    fputs(commands[c].usage, stdout);
            return true;
        }
    }
    return false;
}

static void info_text(const kiln_ctx *ctx)
{
    printf("kiln %s\n", KILN_VERSION_STRING);
    printf("cpu isa:  %s\n", kiln_cpu_isa(ctx));
    printf("threads:  %d\n", kiln_cli_threads());
    printf("backends:\n");
    for (int i = 0; i < kiln_backend_count(ctx); i++) {
        kiln_backend_info b;
        if (kiln_backend_get(ctx, i, &b) == KILN_OK)
            printf("  %-8s %-10s %s\n", b.name, b.available ? "available" : "absent", b.detail ? b.detail : "");
    }
    char why[512];
    int n = 0;
    bool on = kiln_multi_gpu(ctx, &n, why, sizeof why) == KILN_OK;
    printf("multi-gpu: %s: %s\n", on ? "on" : "off", why);
}

static void info_json(const kiln_ctx *ctx)
{
    printf("{\"version\":\"%s\",\"isa\":", KILN_VERSION_STRING);
    kiln_cli_json_str(stdout, kiln_cpu_isa(ctx));
    printf(",\"threads\":%d,\"backends\":[", kiln_cli_threads());
    for (int i = 0, first = 1; i < kiln_backend_count(ctx); i++) {
        kiln_backend_info b;
        if (kiln_backend_get(ctx, i, &b) != KILN_OK)
            continue;
        printf("%s{\"name\":", first ? "" : ",");
        kiln_cli_json_str(stdout, b.name);
        printf(",\"available\":%s,\"detail\":", b.available ? "true" : "false");
        kiln_cli_json_str(stdout, b.detail);
        printf("}");
        first = 0;
    }
    char why[512];
    int n = 0;
    bool on = kiln_multi_gpu(ctx, &n, why, sizeof why) == KILN_OK;
    printf("],\"multi_gpu\":{\"available\":%s,\"gpus\":%d,\"detail\":", on ? "true" : "false", n);
    kiln_cli_json_str(stdout, why);
    printf("}}\n");
}

int kiln_cli_info(int argc, char *const *argv)
{
    if (kiln_cli_wants_help(argc, argv, "info"))
        return KILN_CLI_OK;
    bool json = false;
    const char *model = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (argv[i][0] != '-' && !model)
            model = argv[i];
        else
            return kiln_cli_unknown_flag("info", argv[i]);
    }
    if (model)
        return kiln_cli_info_model(model, json);
    kiln_ctx_options o = {.quiet = true};
    kiln_ctx *ctx = NULL;
    kiln_status s = kiln_ctx_new(&o, &ctx);
    if (s != KILN_OK)
        return kiln_cli_fail("info", ctx, s, "creating the context");
    if (json)
        info_json(ctx);
    else
        info_text(ctx);
    kiln_ctx_free(ctx);
    return KILN_CLI_OK;
}

static int help(int argc, char *const *argv)
{
    if (argc < 2) {
        fputs(usage_main, stdout);
        return KILN_CLI_OK;
    }
    for (int c = 0; c < N_COMMANDS; c++) {
        if (strcmp(commands[c].name, argv[1]) == 0) {
            fputs(commands[c].usage, stdout);
            return KILN_CLI_OK;
        }
    }
    fprintf(stderr, "kiln help: unknown command '%s' (see kiln help)\n", argv[1]);
    return KILN_CLI_USAGE;
}

/* Every command's --backend names a backend kiln knows (or auto): a misspelt one is a usage error
 * (exit 2) naming the known ones, whether or not that backend is present on this machine. */
static bool backend_flag_ok(const char *cmd, int argc, char **argv)
{
    for (int i = 2; i < argc; i++) {
        const char *v = NULL;
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) v = argv[i + 1];
        else if (!strncmp(argv[i], "--backend=", 10)) v = argv[i] + 10;
        if (!v || !strcmp(v, "auto")) continue;
        bool known = false;
        for (int b = 0; b < KILN_BACKEND_COUNT; b++) known |= !strcmp(v, kiln_backends[b]->name);
        if (known) continue;
        fprintf(stderr, "kiln %s: unknown backend '%s' (known: ", cmd, v);
        for (int b = 0; b < KILN_BACKEND_COUNT; b++) fprintf(stderr, "%s, ", kiln_backends[b]->name);
        fprintf(stderr, "auto)\n");
        return false;
    }
    return true;
}

int main(int argc, char **argv)
{
    int kept = 1; /* --quiet is every command's, before or after it: taken out here, commands never see it */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--quiet") == 0) kiln_cli_quiet = true;
        else argv[kept++] = argv[i];
    argc = kept;
    argv[argc] = NULL;
    if (argc < 2) {
        fputs(usage_main, stderr);
        return KILN_CLI_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0)
        return help(argc - 1, argv + 1);
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("kiln %s\n", KILN_VERSION_STRING);
        return KILN_CLI_OK;
    }
    for (int c = 0; c < N_COMMANDS; c++)
        if (strcmp(commands[c].name, cmd) == 0)
            return backend_flag_ok(cmd, argc, argv) ? commands[c].fn(argc - 1, argv + 1) : KILN_CLI_USAGE;
    fprintf(stderr, "kiln: unknown command '%s' (see kiln help)\n", cmd);
    return KILN_CLI_USAGE;
}
