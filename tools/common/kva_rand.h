/*
 * The one pseudo-random generator of the tools, the tests and the
 * benchmarks: splitmix64.  Every state is valid (a seed of 0 works, unlike
 * xorshift), the sequence is the same on every machine, so a failing seed
 * or a benchmark workload reproduces, and it is a few instructions.  It
 * is not for secrets: the module's bucket secret comes from getrandom().
 */

#ifndef _KVA_RAND_H_INCLUDED_
#define _KVA_RAND_H_INCLUDED_


#include <stdint.h>


static inline uint64_t
kva_rand_next(uint64_t *state)
{
    uint64_t  z;

    z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;

    return z ^ (z >> 31);
}


/* in [0, n); the modulo bias is below 2^-40 for the n the tools use */

static inline uint64_t
kva_rand_below(uint64_t *state, uint64_t n)
{
    return kva_rand_next(state) % n;
}


/* uniform in [0, 1), 53 bits */

static inline double
kva_rand_unit(uint64_t *state)
{
    return (double) (kva_rand_next(state) >> 11) / 9007199254740992.0;
}


#endif /* _KVA_RAND_H_INCLUDED_ */
