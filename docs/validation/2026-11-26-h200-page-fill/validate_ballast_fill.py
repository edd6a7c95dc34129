# Fills an idle GPU one 2 MiB cuMemAlloc at a time after a ballast built as
# gpu-backend builds it (see README.md beside this file); one JSON line per fill.
import ctypes as C,json
c=C.CDLL("libcuda.so.1");S=C.c_size_t;U=C.c_uint64;B=C.byref;P=2<<20
def ok(r):
    if r:raise SystemExit(r)
def fr():
    f,t=S(),S();ok(c.cuMemGetInfo_v2(B(f),B(t)));return f.value
def al(n):
    p=U();return p.value if c.cuMemAlloc_v2(B(p),S(n))==0 else None
def fe(p):ok(c.cuMemFree_v2(U(p)))
ok(c.cuInit(0));d=C.c_int();ok(c.cuDeviceGet(B(d),0));x=C.c_void_p();ok(c.cuDevicePrimaryCtxRetain(B(x),d));ok(c.cuCtxSetCurrent(x))
def ballast(t,single):
    bs=[];f=fr();mx=1<<62
    if single:
        p=al((f-t)//P*P);bs.append(p);return bs
    for _ in range(10000):
        w=min((f-t)//P*P,mx)
        if w<P:break
        p=al(w)
        if p is None:
            if w==P:break
            mx=max(w//2//P*P,P);continue
        bs.append(p);n=fr()
        if n>=t:f=n;continue
        bs.pop();fe(p);f=fr()
        if w==P:break
        mx=max(w//2//P*P,P)
    return bs
def fill(sz):
    ps=[];b=fr();dr=[]
    while True:
        p=al(sz)
        if p is None:break
        ps.append(p);n=fr()
        if b-n>P:dr.append([len(ps)-1,b-n])
        b=n
    for p in ps:fe(p)
    return len(ps),dr
for t in [1024<<20,14336<<20]:
  for single in [0,1,0]:
    bs=ballast(t,single);f=fr();n,dr=fill(P);f2=fr()
    for p in bs:fe(p)
    print(json.dumps(dict(t=t>>20,single=single,chunks=len(bs),free=f,model=(f-3276800)//P,fitted=n,drops=dr[:9],free_after_fill_freed=f2)))
