# How often a warp of the INT32 path shifts oi at tile j: some row of its 16 moved its integer
# running maximum m = max(m, ceil(t)) (t the tile's largest logit, log2 units). Logits of the
# bench's uniform inputs (Q, K uniform in [-2, 2), d 128, softmax scale 1/sqrt(128)) taken as
# Gaussian, std (4/3) ln->log2 = 1.923 per row (CLT over the 128 products); quantization ignored.
import random, math
random.seed(1)
SIG = (4.0 / 3.0) * 1.4426950408889634
W, ROWS, TILES = 300, 16, 64
hits = [0] * TILES
for w in range(W):
    m = [None] * ROWS
    for j in range(TILES):
        moved = False
        for r in range(ROWS):
            t = max(random.gauss(0.0, SIG) for _ in range(64))
            c = math.ceil(t)
            if m[r] is None or c > m[r]:
                m[r] = c
                moved = True
        hits[j] += moved
seg = [sum(hits[k:k + 8]) / (8 * W) for k in range(0, TILES, 8)]
print("P(warp shifts oi) by segment of 8 tiles (0-8, 8-16, ...):", " ".join("%.2f" % s for s in seg))
print("tile 0..3:", " ".join("%.2f" % (hits[j] / W) for j in range(4)))
