# Case 43: what the sandbox can read of the host: the kernel command line, modules, disks, DMI.
PATHS = ("/proc/cmdline", "/proc/modules", "/proc/partitions", "/proc/diskstats", "/proc/config.gz",
         "/proc/bootconfig", "/sys/devices/virtual/dmi/id/product_name", "/sys/devices/virtual/dmi/id/sys_vendor",
         "/sys/class/dmi/id/product_name")
out = {}
for path in PATHS:
    try:
        with open(path, "rb") as f:
            out[path] = f.read(1 << 16).decode("latin-1")
    except OSError as e:
        out[path] = {"errno": ename(e.errno)}
emit(out)
