#!/usr/bin/env python3
"""List-scheduling model of turbo_prefill_wgf_* CTAs (issue 11 round 5), the prediction before
device call 1. A CTA's time is A (per-CTA cost, two guesses: 13.5 and 4 us) plus, per 64-key
tile, 1.107 / 0.85 / 0.6 us with three / two / one consumer warpgroups still active (round 4's
per-tile fit at three; fewer warpgroups guessed faster); CTAs are dispatched greedily in linear
block order onto 132 SMs. Orders: cur = main (three Q blocks of one query head, each head's
longest causal blocks first), group = three consecutive (query block, query head) items of a KV
head, KV-head-major, groupmajor = the same, trip-major. Prints the makespan in us and the
speedup over cur for 32 query / 8 KV heads.
"""
import heapq
def tiles(qb, S, causal):
    r0=qb*64
    if r0>=S: return 0
    nq=min(64,S-r0)
    if not causal: return (S+63)//64
    return (r0+nq-1+1+63)//64
COST={3:1.107,2:0.85,1:0.6,0:0}
def cta_time(ts,A):
    ts=sorted(ts); t=A; prev=0
    for i,n in enumerate(ts):
        act=len([x for x in ts if x>prev])
        t+=(n-prev)*COST[min(act,3)]; prev=n
    return t
def sched(durs, sms=132):
    h=[0.0]*sms
    for d in durs:
        t=heapq.heappop(h); heapq.heappush(h,t+d)
    return max(h)
def run(B,S,causal,A,mode,H=32,G=4):
    nqb=(S+63)//64; ctas=[]
    if mode=='cur':
        ncta=(nqb+2)//3
        for b in range(B):
            for h in range(H):
                for x in range(ncta):
                    trip=ncta-1-x; ctas.append([tiles(3*trip+w,S,causal) for w in range(3)])
    else:
        n=G*nqb; ncta=(n+2)//3; per=[]
        for x in range(ncta):
            trip=ncta-1-x
            per.append([tiles(((3*trip+w)//G) if 3*trip+w<n else 10**9,S,causal) for w in range(3)])
        if mode=='group':
            for b in range(B):
                for hk in range(H//G): ctas+=per
        else:
            for x in range(ncta):
                for b in range(B):
                    for hk in range(H//G): ctas.append(per[x])
    return sched([cta_time(c,A) for c in ctas])
for A in (13.5,4.0):
  for (B,S) in ((4,1024),(4,4096),(1,16384),(1,32768)):
    for causal in (False,True):
        r={m:run(B,S,causal,A,m) for m in ('cur','group','groupmajor')}
        print(A,B,S,causal,' '.join('%s %.0f(%.3f)'%(m,v,r['cur']/v) for m,v in r.items()))
