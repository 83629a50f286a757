# Case 4: setuid/setgid files anywhere, and whether running one raises the effective ids.
# sys.argv[1:] = binaries to run (a setuid-root copy of `id` planted in a declared input).
found = []
for top in ("/",):
    for dirpath, dirnames, filenames in os.walk(top):
        if dirpath in ("/proc", "/sys", "/dev"):
            dirnames[:] = []
            continue
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                found.append(path)
ran = {}
for path in sorted(set(found) | set(sys.argv[1:])):
    st = os.stat(path)
    ran[path] = {
        "mode": oct(st.st_mode & 0o7777), "owner": [st.st_uid, st.st_gid],
        "euid": run([path, "-u"]), "egid": run([path, "-g"]),
    }
emit({"setuid_files": sorted(found), "ran": ran, "uid": os.getuid()})
