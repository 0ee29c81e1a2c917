#!/usr/bin/env python3
"""Call circles between the files of one source folder, from the objects' symbol tables (nm):
file A calls file B when A's object needs a symbol B's object defines. Prints each strongly
connected set of more than one file. Usage: scripts/circles.py BUILD_DIR src/codegen"""
import subprocess, sys, os, glob, signal
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # | head is fine
build, folder = sys.argv[1], sys.argv[2].rstrip('/')
objs = [o for o in sorted(glob.glob(os.path.join(build, 'CMakeFiles', 'kiln_obj.dir', folder, '*.o')))
        if os.path.exists(os.path.join(folder, os.path.basename(o)[:-2]))]  # no stale objects of removed files
defs, uses = {}, {}
for o in objs:
    f = os.path.basename(o)[:-2]
    out = subprocess.run(['nm', o], capture_output=True, text=True).stdout
    uses[f] = set()
    for line in out.splitlines():
        p = line.split()
        if len(p) == 3 and p[1] in 'TDRBC': defs[p[2]] = f
        elif len(p) == 2 and p[0] == 'U': uses[f].add(p[1])
edges = {f: sorted({defs[s] for s in u if s in defs and defs[s] != f}) for f, u in uses.items()}
# Tarjan
idx, low, st, on, sccs, c = {}, {}, [], set(), [], [0]
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges[v]:
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        sccs.append(sorted(comp))
for v in sorted(edges):
    if v not in idx: sc(v)
big = [s for s in sccs if len(s) > 1]
print(f"{folder}: {len(edges)} files, {sum(len(e) for e in edges.values())} file->file call edges, "
      f"largest circle {max((len(s) for s in sccs), default=0)} file(s)")
for s in big: print("  circle:", " <-> ".join(s))
for f in sorted(edges): print(f"  {f} -> {', '.join(edges[f]) or '-'}")
