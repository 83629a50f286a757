# Case 16: every mount as the sandbox sees it.
mounts = []
with open("/proc/self/mountinfo") as f:
    for line in f:
        left, _, right = line.strip().partition(" - ")
        fields, r = left.split(), right.split()
        mounts.append({"major_minor": fields[2], "root": fields[3], "mountpoint": fields[4],
                       "options": fields[5].split(","),
                       "fstype": r[0], "source": r[1] if len(r) > 1 else "", "super": r[2] if len(r) > 2 else ""})
emit({"mounts": mounts})
