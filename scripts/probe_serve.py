#!/usr/bin/env python3
# Hostile-client probes against a running `ebb serve` on loopback, each bounded in
# size and time, printing what each gets (docs/serve.md, "Connections and hostile input"):
#   build/ebb serve -m ../shared/models/stories260K.gguf --port 18095 --api-key k1 --quiet &
#   python3 scripts/probe_serve.py 18095 $(pgrep -f "port 18095") k1
import socket, sys, time, threading, json, os
port, pid, key = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def rss():
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1])//1024
def hwm():
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmHWM"): return int(l.split()[1])//1024
def conn():
    s=socket.create_connection(("127.0.0.1",port)); s.settimeout(30); return s
def readall(s, limit=30):
    s.settimeout(limit); out=b""
    try:
        while True:
            d=s.recv(65536)
            if not d: break
            out+=d
    except Exception: pass
    return out
def status(b): return b.split(b"\r\n",1)[0].decode(errors="replace")
res={}
# 2a: 48 MiB chunked, with key
r0=rss(); s=conn(); t=time.time()
s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
chunk=b" "*(1<<20); sent=0
try:
    for i in range(48):
        s.sendall(b"100000\r\n"+chunk+b"\r\n"); sent+=1
except Exception: pass
b=readall(s,10); res["chunked_48MiB_with_key"]={"answer":status(b),"MiB_sent_before_refusal":sent,"s":round(time.time()-t,3),"rss_before_MB":r0,"rss_after_MB":rss()}
# 2b: 200 MB chunked without key
r0=rss(); s=conn(); t=time.time()
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
b=readall(s,5); res["chunked_200MB_no_key"]={"answer":status(b),"s":round(time.time()-t,3),"rss_before_MB":r0,"rss_after_MB":rss()}
# 3: 4 MiB of '[' x8 in parallel
r0=rss(); h0=hwm(); answers=[]
def nest():
    s=conn(); body=b"["*((4<<20)-64)
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()+body)
    answers.append(status(readall(s,30)))
ths=[threading.Thread(target=nest) for _ in range(8)]; t=time.time()
[x.start() for x in ths]; [x.join() for x in ths]
time.sleep(0.5)
res["nesting_4MiB_x8"]={"answers":sorted(set(answers)),"s":round(time.time()-t,2),"rss_before_MB":r0,"peak_rss_MB":hwm(),"rss_idle_after_MB":rss()}
# 4: overflow
s=conn(); body=b'{"prompt":"hi","max_tokens":1e400}'
s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()+body)
b=readall(s,10); res["max_tokens_1e400"]={"answer":status(b),"body":b.split(b"\r\n\r\n",1)[1].decode()}
# 5: pipelining
s=conn(); one=lambda c,close: (f"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Length: {len(c)}\r\n"+("Connection: close\r\n" if close else "")+"\r\n").encode()+c
s.sendall(one(b'{"content":"Once"}',False)+one(b'{"content":"upon a time"}',True))
b=readall(s,10); res["pipelined_2"]={"answers":b.count(b"HTTP/1.1 200")}
# 6: slowloris, 40 connections a header byte a second; /health latency
slow=[conn() for _ in range(40)]
lat=[]; stop=[False]
def trickle():
    msg=b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: "+b"a"*100
    i=0
    while not stop[0]:
        for c in slow:
            try: c.send(msg[i:i+1])
            except Exception: pass
        i+=1; time.sleep(1)
th=threading.Thread(target=trickle); th.start()
for i in range(15):
    t=time.time(); s=conn(); s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); b=readall(s,10); lat.append((status(b), round((time.time()-t)*1000,1))); time.sleep(1)
stop[0]=True; th.join()
closed=0
for c in slow:
    b=readall(c,2); closed+= b.startswith(b"HTTP/1.1 408")
res["slowloris_40"]={"health_answers":sorted(set(x[0] for x in lat)),"health_ms_max":max(x[1] for x in lat),"slow_conns_408":closed}
print(json.dumps(res, indent=1))
