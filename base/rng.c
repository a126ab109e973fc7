/* rng.c: the seedable random number generator of base.h.
 *
 * xoshiro256** 1.0 (Blackman & Vigna, "Scrambled linear pseudorandom number
 * generators", 2018, https://prng.di.unimi.it/xoshiro256starstar.c), with
 * its 256-bit state filled from a 64-bit seed by splitmix64 as the authors
 * recommend. Only integer arithmetic decides the stream, so every node that
 * shares a seed draws the same numbers on every platform; st_rng_normal
 * additionally goes through libm's log and cos.
 */
#include <math.h>

#include "base/base.h"

static uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

/* splitmix64 (Steele, Lea & Flood, 2014): one step of a Weyl sequence
 * followed by a strong 64-bit mixer. */
static uint64_t splitmix64(uint64_t* x) {
  uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

void st_rng_seed(st_rng_t* rng, uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++)
    rng->s[i] = splitmix64(&x);
  /* splitmix64 is a bijection of distinct Weyl steps, so the four words are
   * never all zero (the one state xoshiro cannot leave). */
}

uint64_t st_rng_next(st_rng_t* rng) {
  uint64_t* s = rng->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double st_rng_uniform(st_rng_t* rng) {
  /* The top 53 bits (the better ones of xoshiro's output) as a multiple of
   * 2^-53: every double in [0, 1) on that grid, equally likely. */
  return (double) (st_rng_next(rng) >> 11) * 0x1.0p-53;
}

uint64_t st_rng_below(st_rng_t* rng, uint64_t bound) {
  if (bound <= 1)
    return 0;
  /* Rejection: 2^64 mod bound values at the bottom of the range would make
   * the low residues more likely, so they are redrawn. threshold equals
   * (2^64 - bound) mod bound = 2^64 mod bound. At most half of all draws
   * are rejected (bound just above 2^63), typically almost none. */
  uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    uint64_t r = st_rng_next(rng);
    if (r >= threshold)
      return r % bound;
  }
}

double st_rng_normal(st_rng_t* rng) {
  /* Box-Muller; u1 in (0, 1] keeps log() finite. The second variate of the
   * pair is dropped: the state is exactly the four xoshiro words. */
  double u1 = 1.0 - st_rng_uniform(rng);
  double u2 = st_rng_uniform(rng);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}
