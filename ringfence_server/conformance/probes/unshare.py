# Case 5: new namespaces of every kind, each tried in its own child.
FLAGS = {"user": 0x10000000, "mnt": 0x00020000, "net": 0x40000000, "pid": 0x20000000,
         "ipc": 0x08000000, "uts": 0x04000000, "cgroup": 0x02000000}
emit({
    "unshare": {name: in_child(lambda flag=flag: syscall(272, flag)) for name, flag in FLAGS.items()},
    "unshare_cmd": run(["unshare", "-Ur", "id", "-u"]),
})
