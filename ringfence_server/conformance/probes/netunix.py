# Case 15: the unix sockets the sandbox can see in /proc/net/unix.
with open("/proc/net/unix") as f:
    lines = f.read().splitlines()
emit({"header": lines[0] if lines else None, "entries": lines[1:],
      "paths": sorted(line.split()[7] for line in lines[1:] if len(line.split()) >= 8)})
