/* Criterion, or (with -DKILN_PLAIN_TEST) a stand-in for the few Criterion macros a test uses, so
 * the same test file also builds as a plain program: Criterion cannot start under ThreadSanitizer
 * (its inheritable arena clashes with TSan's memory map: Snaipe/Criterion#274), and CI's TSan stage
 * runs test_concurrency that way. The stand-in runs every Test() in order in one process; a failed
 * assertion prints file:line and the message and exits 1; cr_skip ends that test. */
#pragma once

#ifndef KILN_PLAIN_TEST
#include <criterion/criterion.h>
#else
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct plain_test {
    const char *name;        /* suite/name */
    void (*fn)(void);        /* body */
} plain_test;

static plain_test plain_tests[64];
static int        plain_n;
static jmp_buf    plain_skip;

#define Test(suite, name, ...)                                                                           \
    static void suite##_##name(void);                                                                    \
    __attribute__((constructor)) static void plain_reg_##suite##_##name(void)                            \
    {                                                                                                    \
        if (plain_n < 64) plain_tests[plain_n++] = (plain_test){#suite "/" #name, suite##_##name};       \
    }                                                                                                    \
    static void suite##_##name(void)

#define cr_assert(cond, ...)                                                                             \
    do {                                                                                                 \
        if (!(cond)) {                                                                                   \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #cond);                 \
            fprintf(stderr, "  " __VA_ARGS__);                                                           \
            fprintf(stderr, "\n");                                                                       \
            exit(1);                                                                                     \
        }                                                                                                \
    } while (0)
#define cr_assert_eq(a, b, ...)  cr_assert((a) == (b), __VA_ARGS__)
#define cr_assert_neq(a, b, ...) cr_assert((a) != (b), __VA_ARGS__)
#define cr_assert_leq(a, b, ...) cr_assert((a) <= (b), __VA_ARGS__)
#define cr_skip(...)                                                                                     \
    do {                                                                                                 \
        fprintf(stderr, "  skipped: ");                                                                  \
        fprintf(stderr, __VA_ARGS__);                                                                    \
        fprintf(stderr, "\n");                                                                           \
        longjmp(plain_skip, 1);                                                                          \
    } while (0)

int main(void)
{
    for (volatile int i = 0; i < plain_n; i++) {
        fprintf(stderr, "[RUN ] %s\n", plain_tests[i].name);
        if (setjmp(plain_skip) == 0) plain_tests[i].fn();
        fprintf(stderr, "[DONE] %s\n", plain_tests[i].name);
    }
    fprintf(stderr, "%d tests passed or skipped\n", plain_n);
    return 0;
}
#endif
