# Case 22: packet, raw and vsock sockets. Only created, never connected or bound.
SOCKETS = {
    "AF_PACKET/SOCK_RAW": (17, socket.SOCK_RAW, 0x0300),  # htons(ETH_P_ALL)
    "AF_PACKET/SOCK_DGRAM": (17, socket.SOCK_DGRAM, 0x0300),
    "AF_INET/SOCK_RAW/ICMP": (socket.AF_INET, socket.SOCK_RAW, 1),
    "AF_INET/SOCK_RAW/RAW": (socket.AF_INET, socket.SOCK_RAW, 255),
    "AF_INET6/SOCK_RAW/ICMPV6": (socket.AF_INET6, socket.SOCK_RAW, 58),
    "AF_VSOCK/SOCK_STREAM": (40, socket.SOCK_STREAM, 0),
    "AF_VSOCK/SOCK_DGRAM": (40, socket.SOCK_DGRAM, 0),
}


def create(family, kind, proto):
    def go():
        socket.socket(family, kind, proto).close()
    return attempt(go)


emit({name: in_child(lambda a=a: create(*a)) for name, a in SOCKETS.items()})
