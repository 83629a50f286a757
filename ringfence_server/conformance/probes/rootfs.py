# Case 12: writes to the root filesystem.
def create(path):
    def go():
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        os.unlink(path)
    return attempt(go)


emit({
    "create_root": create("/ringfence-probe"),
    "create_var_tmp": create("/var/tmp/ringfence-probe"),  # world-writable in the image
    "write_passwd": open_for_write("/etc/passwd"),
    "append_passwd": attempt(lambda: os.close(os.open("/etc/passwd", os.O_WRONLY | os.O_APPEND))),
    "chmod_runner": attempt(os.chmod, "/usr/bin/tini", 0o4755),
    "readonly": is_readonly("/"),
})
