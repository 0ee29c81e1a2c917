/* Linked into every Criterion test under KILN_SANITIZE: LeakSanitizer stays on in the workers,
 * where every test (and its .init/.fini) runs, and is off in Criterion's runner process, which runs
 * no kiln code and at exit may still hold a pending timeout entry of its watchdog thread (a 48-byte
 * calloc in libcriterion, seen in test_paged and test_cli). Workers carry BXFI_MAP in their
 * environment (boxfort's sandbox); the runner does not. Must not hide a leak of a test. */
#include <stdlib.h>

int __lsan_is_turned_off(void);

int __lsan_is_turned_off(void)
{
    return getenv("BXFI_MAP") == NULL;
}
