import csv,sys,glob,os
rows=524288
def load(f):
    r=list(csv.reader(open(f))); return dict(zip(r[0],r[2]))
def g(d,k):
    try: return float(d[k].replace(',',''))
    except: return float('nan')
keys=sys.argv[1:]
print('| metric | '+' | '.join(os.path.basename(k).replace('_raw.csv','') for k in keys)+' |')
print('|---|'+'---|'*len(keys))
D=[load(k) for k in keys]
def line(name,fn): print(f'| {name} | '+' | '.join(fn(d) for d in D)+' |')
line('duration under ncu (µs)', lambda d: f"{g(d,'gpu__time_duration.sum'):.1f}")
line('SM clock (GHz)', lambda d: f"{g(d,'gpc__cycles_elapsed.avg.per_second'):.2f}")
line('DRAM throughput, % of peak', lambda d: f"{g(d,'dram__throughput.avg.pct_of_peak_sustained_elapsed'):.1f}")
line('warp instructions per row', lambda d: f"{g(d,'smsp__inst_executed.sum')/rows:.1f}")
line('shared wavefronts per row', lambda d: f"{g(d,'l1tex__data_pipe_lsu_wavefronts_mem_shared.sum')/rows:.1f}")
line('L1 data pipe (LSU wavefronts), % of peak', lambda d: f"{g(d,'l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed'):.1f}")
line('issue active, % of cycles (per scheduler)', lambda d: f"{g(d,'smsp__issue_active.avg.pct_of_peak_sustained_active'):.1f}")
line('warps per scheduler', lambda d: f"{g(d,'smsp__warps_active.avg.per_cycle_active'):.2f}")
line('eligible warps per scheduler', lambda d: f"{g(d,'smsp__warps_eligible.avg.per_cycle_active'):.2f}")
line('cycles per issued instruction', lambda d: f"{g(d,'smsp__average_warp_latency_per_inst_issued.ratio'):.2f}")
for p in ['alu','fma','fmaheavy','lsu','adu','xu','uniform','cbu']:
    k=f'sm__inst_executed_pipe_{p}.avg.pct_of_peak_sustained_active'
    if k in D[0]: line(f'pipe {p}, % of peak issue', lambda d,k=k: f"{g(d,k):.1f}")
k='sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active'
line('tensor pipe (hmma cycles active), %', lambda d: f"{g(d,k):.1f}")
stalls=['long_scoreboard','wait','gmma','not_selected','short_scoreboard','dispatch_stall','math_pipe_throttle','barrier','mio_throttle','branch_resolving','no_instruction','selected']
for s in stalls:
    kk=f'smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio'
    line(f'stall {s} (cycles per issue)', lambda d,kk=kk: f"{g(d,kk):.2f}")
