# Round 14: how often a warp (16 rows) and a warpgroup (64 rows, one query block) of the INT32 path
# shift oi at tile j, over 512 tiles (1 x 32768) as well as 64 (4 x 4096), under round 12's model
# (moves.py: a row's logits Gaussian, std 1.923 in log2 units, the bench's uniform inputs; quantization
# ignored; the tile maximum of 64 keys drawn as Phi^-1(u^(1/64)) sigma). The twin's count on 4 x 4096
# (moves_twin.txt) checks the model's first 64 tiles. Headroom h: past a row's first tile a move goes to
# ceil(t) + h.
import math, random
from statistics import NormalDist
random.seed(1)
SIG, ROWS, TILES, BLOCKS = 1.923, 64, 512, 60
inv = NormalDist().inv_cdf
res = {h: ([0] * TILES, [0] * TILES) for h in (0, 1, 2)}
for b in range(BLOCKS):
    t = [[SIG * inv(random.random() ** (1 / 64)) for _ in range(TILES)] for _ in range(ROWS)]
    for h in (0, 1, 2):
        warp, wg = res[h]
        m = [math.ceil(t[r][0]) for r in range(ROWS)]
        for j in range(1, TILES):
            moved = [False] * 4
            for r in range(ROWS):
                c = math.ceil(t[r][j])
                if c > m[r]:
                    m[r] = c + h
                    moved[r // 16] = True
            warp[j] += sum(moved)
            wg[j] += any(moved)
segs = [(1, 2), (2, 4), (4, 8), (8, 16), (16, 32), (32, 64), (64, 128), (128, 256), (256, 512)]
print("P(a warp shifts) / P(the warpgroup shifts: some warp of its 4), per tile segment; h = headroom")
print("| tiles | " + " | ".join(f"warp h{h} | wg h{h}" for h in (0, 1, 2)) + " |")
print("|---|" + "---|" * 6)
for a, bnd in segs:
    cells = []
    for h in (0, 1, 2):
        warp, wg = res[h]
        n = (bnd - a) * BLOCKS
        cells += [f"{sum(warp[a:bnd]) / (4 * n):.3f}", f"{sum(wg[a:bnd]) / n:.3f}"]
    print(f"| {a}-{bnd - 1} | " + " | ".join(cells) + " |")
for n_t in (64, 512):
    cells = []
    for h in (0, 1, 2):
        warp, wg = res[h]
        cells.append(f"h{h}: warp {sum(warp[1:n_t]) / (4 * BLOCKS):.1f}, wg {sum(wg[1:n_t]) / BLOCKS:.1f}")
    print(f"shifting tiles of {n_t} (expected count per warp / per warpgroup): " + "; ".join(cells))
