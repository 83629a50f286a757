# Case 13: a binary copied into /tmp (and /dev/shm) cannot be executed or mapped executable;
# a script handed to an interpreter still runs, which noexec does not prevent.
import mmap
import shutil


def plant(directory):
    path = os.path.join(directory, "ringfence-true")
    shutil.copyfile("/bin/true", path)
    os.chmod(path, 0o755)
    return path


def mmap_exec(path):
    def go():
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC)
            m.close()
    return attempt(go)


LOADER = "/lib64/ld-linux-x86-64.so.2"
out = {}
for d in ("/tmp", "/dev/shm"):
    p = plant(d)
    out[d] = {"exec": run([p]), "mmap_exec": mmap_exec(p), "noexec_flag": bool(os.statvfs(d).f_flag & os.ST_NOEXEC),
              # the classic noexec bypass: let the dynamic loader map the binary itself
              "via_loader": run([LOADER, p])}
with open("/tmp/ringfence.sh", "w") as f:
    f.write("echo script-ran\n")
out["sh_script"] = run(["sh", "/tmp/ringfence.sh"])
emit(out)
