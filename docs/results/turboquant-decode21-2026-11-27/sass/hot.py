import csv,sys,re,collections
fn=sys.argv[1]
rows=list(csv.reader(open(fn)))
h=rows[1]; data=rows[2:]
ix={k:i for i,k in enumerate(h)}
base=int(data[0][0],16)
stalls=[k for k in h if k.startswith('stall_') and 'Not Issued' not in k]
recs=[]
for r in data:
    try: off=int(r[0],16)-base
    except: continue
    src=r[1].strip(); o=re.sub(r'^@!?U?P[T0-9]+\s+','',src).split()[0] if src else '?'
    recs.append((off,o,src,int(r[ix['# Samples']] or 0),int(r[ix['Instructions Executed']] or 0),{s:int(r[ix[s]] or 0) for s in stalls}))
tot=sum(x[3] for x in recs)
# inner loop: take instructions executed count == max-ish (hot) 
mx=max(x[4] for x in recs)
lo=int(sys.argv[2],16); hi=int(sys.argv[3],16)
L=[x for x in recs if lo<=x[0]<=hi]
lt=sum(x[3] for x in L)
print(fn,'samples total',tot,'in loop',lt,'%.1f%%'%(100*lt/tot))
cat=collections.defaultdict(lambda:[0,collections.Counter(),0])
for off,o,src,n,ex,st in L:
    b=o.split('.')[0]
    if b=='IMAD' and 'MOV' in o: b='IMAD.MOV'
    cat[b][0]+=n; cat[b][1].update(st); cat[b][2]+=1
print('%-10s %6s %5s %5s  top stalls'%('op','samp','%','static'))
for b,(n,st,cnt) in sorted(cat.items(),key=lambda t:-t[1][0])[:18]:
    print('%-10s %6d %5.1f %5d  %s'%(b,n,100*n/lt,cnt,', '.join('%s %d'%(k[6:],v) for k,v in st.most_common(4) if v)))
agg=collections.Counter()
for x in L: agg.update(x[5])
print('loop stalls:',', '.join('%s %.1f%%'%(k[6:],100*v/lt) for k,v in agg.most_common(9)))
