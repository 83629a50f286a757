# Case 17: what /dev holds, block devices anywhere in it, and what fdisk -l would find: each
# partition the kernel lists in /proc/partitions, opened read-only through /dev.
entries, block = {}, []
for dirpath, dirnames, filenames in os.walk("/dev"):
    for name in dirnames + filenames:
        path = os.path.join(dirpath, name)
        st = os.lstat(path)
        kind = ("blk" if stat.S_ISBLK(st.st_mode) else "chr" if stat.S_ISCHR(st.st_mode) else
                "dir" if stat.S_ISDIR(st.st_mode) else "lnk" if stat.S_ISLNK(st.st_mode) else "other")
        entries[path] = kind
        if kind == "blk":
            block.append(path)
partitions = []
try:
    with open("/proc/partitions") as f:
        partitions = [line.split()[3] for line in f.read().splitlines()[2:] if len(line.split()) == 4]
except OSError:
    pass
opened = {}
for p in partitions:
    opened[p] = attempt(lambda p=p: os.close(os.open("/dev/" + p, os.O_RDONLY)))
# A node for the host's first virtio disk (254:0), made in /tmp (nodev) and then opened.
mknod = attempt(os.mknod, "/tmp/ringfence-blk", 0o600 | stat.S_IFBLK, os.makedev(254, 0))
if mknod["ok"]:
    mknod["open"] = attempt(lambda: os.close(os.open("/tmp/ringfence-blk", os.O_RDONLY)))
emit({"top": sorted(os.listdir("/dev")), "entries": entries, "block_devices": sorted(block),
      "partitions": partitions, "open_partitions": opened, "mknod_block": mknod,
      "fdisk": run(["fdisk", "-l"])})
