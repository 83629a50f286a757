# Case 24: the environment of every process in the sandbox, raw from /proc/*/environ.
envs = {}
for p in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
    try:
        with open(f"/proc/{p}/environ", "rb") as f:
            raw = f.read()
    except OSError as e:
        envs[p] = {"errno": ename(e.errno)}
        continue
    envs[p] = dict(item.decode(errors="replace").partition("=")[::2] for item in raw.split(b"\0") if item)
home = os.path.expanduser("~")
emit({"environ": envs, "pid1": open("/proc/1/cmdline", "rb").read().split(b"\0")[0].decode(),
      "credential_files": [p for p in (home + "/.docker/config.json", home + "/.aws/credentials",
                                       home + "/.kube/config", "/root/.docker/config.json", "/run/secrets")
                           if os.path.lexists(p)]})
