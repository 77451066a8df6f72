// Round 21 (issue-11-prepass21): every (amax, x) pair of bf16 and f16, |x| <= amax, both signs, of the pre-passes' division-free
// INT8 code (turbo_common.cuh int8_code_bits) against quantize_int8 = clamp(rne(x / s)), s = amax / 119, r = 1 / s, where s is
// normal. Build: gcc -O2 -mfma -ffp-contract=off -o chk chk.c -lm. Output (this machine, 2026-11-27):
//   fmt 0 (bf16) fast 31634 slow 1005 checked 1064389198 bad 0
//   fmt 1 (f16)  fast 31743 slow 0 checked 1007713278 bad 0
#include <stdio.h>
#include <math.h>
#include <string.h>
#include <stdint.h>
static float bf(uint16_t b){uint32_t u=(uint32_t)b<<16; float f; memcpy(&f,&u,4); return f;}
static float hf(uint16_t h){ // f16 -> f32 exact
  int s=h>>15, e=(h>>10)&31, m=h&1023; float v;
  if(e==0) v=ldexpf((float)m,-24); else if(e==31) v=m?NAN:INFINITY; else v=ldexpf((float)(m|1024),e-25);
  return s?-v:v;}
static int8_t ref(float x,float s){ if(s==0.0f) return 0; float q=rintf(x/s); if(q>127)q=127; if(q<-127)q=-127; return (int8_t)q;}
static int8_t fast(float x,float s,float r){ volatile float q0=x*r; float q=fmaf(fmaf(-s,q0,x),r,q0); volatile float t=q+12582912.0f; uint32_t u; float tt=t; memcpy(&u,&tt,4); return (int8_t)(uint8_t)u;}
int main(){
  for(int fmt=0;fmt<2;fmt++){
    uint16_t inf= fmt? 0x7c00:0x7f80; long nf=0,ns=0,bad=0,n=0;
    for(uint32_t a=1;a<inf;a++){ float amax= fmt? hf(a):bf(a); float s=amax/119.0f;
      if(!(s>=1.17549435e-38f)){ns++;continue;} nf++; float r=1.0f/s;
      for(uint32_t xb=0;xb<=a;xb++){ float x= fmt? hf(xb):bf(xb);
        for(int sg=0;sg<2;sg++){ float xx= sg?-x:x; n++; if(fast(xx,s,r)!=ref(xx,s)){ if(bad<10) printf("bad fmt %d x %a amax %a\n",fmt,xx,amax); bad++; } } } }
    printf("fmt %d fast %ld slow %ld checked %ld bad %ld\n",fmt,nf,ns,n,bad);
  }
}
