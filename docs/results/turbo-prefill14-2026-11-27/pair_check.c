#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
static int orig(int x, int kn, int dn) {
  if (dn != 0) {
    int s = kn + dn; int r = s < 0 ? 0 : (s > 31 ? 31 : s); int u = -s > 0 ? -s : 0;
    return (int)((uint32_t)(x >> r) << u);
  }
  int sh = kn < 31 ? kn : 31; return x >> sh;
}
static int pair(int x, int kn, int dn) {
  int s = kn + dn; s = s < 31 ? s : 31; uint32_t a = (uint32_t)(s + 32);
  int64_t t = (int64_t)((uint64_t)(uint32_t)x << 32);
  return (int)(uint32_t)(t >> a);
}
int main(void) {
  srand(1); long bad = 0, n = 0;
  for (int it = 0; it < 2000000; ++it) {
    int x = (int)(((uint32_t)rand() << 16) ^ (uint32_t)rand());
    int kn = rand() % 128, dn = rand() % 13 - 6;
    if (rand() % 4 == 0) kn = rand() % 3;
    int s = kn + dn; if (s < 0) x >>= 7;  /* the contract: a left shift by -s <= 6 never overflows */
    ++n; if (orig(x, kn, dn) != pair(x, kn, dn)) { if (bad++ < 5) printf("x %d kn %d dn %d: %d vs %d\n", x, kn, dn, orig(x,kn,dn), pair(x,kn,dn)); }
  }
  printf("%ld cases, %ld differ\n", n, bad);
  return bad != 0;
}
