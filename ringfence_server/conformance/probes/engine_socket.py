# Case 14: any Docker/containerd socket, at a well-known path or anywhere in the filesystem or
# the abstract namespace; each one found is asked GET /info.
WELL_KNOWN = ["/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock",
              "/run/containerd/containerd.sock.ttrpc", "/var/run/crio/crio.sock", "/run/podman/podman.sock",
              "/run/buildkit/buildkitd.sock", "/var/run/docker/containerd/containerd.sock",
              "/run/user/0/docker.sock", "/tmp/docker.sock"]


def filesystem_sockets():
    found = []
    for dirpath, dirnames, filenames in os.walk("/"):
        if dirpath in ("/proc", "/sys"):
            dirnames[:] = []
            continue
        for name in filenames + dirnames:
            path = os.path.join(dirpath, name)
            try:
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    found.append(path)
            except OSError:
                pass
    return found


def abstract_sockets():
    with open("/proc/net/unix") as f:
        rows = f.read().splitlines()[1:]
    return sorted({r.split()[7] for r in rows if len(r.split()) >= 8 and r.split()[7].startswith("@")})


def get_info(address):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(address)
        s.sendall(b"GET /info HTTP/1.0\r\nHost: docker\r\n\r\n")
        data = b""
        while len(data) < 65536:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        return {"answered": bool(data), "response": data.decode(errors="replace")[:1000]}
    except OSError as e:
        return {"answered": False, "errno": ename(e.errno)}
    finally:
        s.close()


fs = filesystem_sockets()
abstract = abstract_sockets()
# /var/run is a link to /run: ask each socket once, by its real path.
candidates = sorted({os.path.realpath(p) for p in fs} | {os.path.realpath(p) for p in WELL_KNOWN if os.path.lexists(p)})
answers = {p: get_info(p) for p in candidates}
answers.update({a: get_info("\0" + a[1:]) for a in abstract})
emit({"filesystem_sockets": sorted(fs), "abstract_sockets": abstract,
      "well_known_present": [p for p in WELL_KNOWN if os.path.lexists(p)],
      "answers": answers})
