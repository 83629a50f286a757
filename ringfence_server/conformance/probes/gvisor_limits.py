# Case 44: threads (not only processes) against the pids budget; device nodes made with mknod;
# the devices /dev offers. sys.argv[1]: how many threads to try.
import threading

WANT = int(sys.argv[1])
stop = threading.Event()
threads, err = [], None
for _ in range(WANT):
    t = threading.Thread(target=stop.wait)
    try:
        t.start()
    except RuntimeError as e:
        err = str(e)
        break
    threads.append(t)
started = len(threads)
stop.set()
for t in threads:
    t.join()

nodes = {}
for name, kind, dev in (("char-null", stat.S_IFCHR, os.makedev(1, 3)), ("char-fuse", stat.S_IFCHR, os.makedev(10, 229)),
                        ("char-tun", stat.S_IFCHR, os.makedev(10, 200)), ("block", stat.S_IFBLK, os.makedev(7, 0)),
                        ("fifo", stat.S_IFIFO, 0), ("regular", stat.S_IFREG, 0)):
    path = "/tmp/rf-node-" + name
    r = attempt(os.mknod, path, kind | 0o666, dev)
    if r["ok"]:
        r["opened"] = attempt(lambda path=path: os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK)))
    nodes[name] = r

devices = {}
for dirpath, dirnames, filenames in os.walk("/dev"):
    for n in dirnames + filenames:
        p = os.path.join(dirpath, n)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            devices[p] = "chr" if stat.S_ISCHR(st.st_mode) else "blk"
opens = {d: attempt(lambda d=d: os.close(os.open(d, os.O_RDWR))) for d in ("/dev/fuse", "/dev/net/tun")}
emit({"threads": started, "thread_error": err, "nodes": nodes, "devices": devices, "opens": opens})
