"""A classic-BPF interpreter for seccomp programs: what the kernel would answer, without a kernel.

It runs agent.py's filter for any architecture the table knows, so the policy can be tested for
aarch64 on this x86_64 machine, and for argument values no test should ever really pass.
"""

import struct

ALLOW, KILL, ERRNO = 0x7FFF0000, 0x80000000, 0x00050000


def run(program, nr, arch, args=(0, 0, 0, 0, 0, 0)):
    """The filter's verdict for one syscall: ("allow",), ("kill",) or ("errno", n)."""
    return walk(program, nr, arch, args)[0]


def walk(program, nr, arch, args=(0, 0, 0, 0, 0, 0)):
    """The filter's verdict for one syscall, and how many instructions gave it."""
    args = list(args) + [0] * (6 - len(args))
    data = struct.pack("<iIQ6Q", nr, arch, 0, *[a & 0xFFFFFFFFFFFFFFFF for a in args])
    ins = [struct.unpack("HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    assert len(ins) <= 4096, "BPF_MAXINSNS"
    acc, pc, steps = 0, 0, 0
    while True:
        code, jt, jf, k = ins[pc]
        pc += 1
        steps += 1
        if code == 0x20:  # BPF_LD|BPF_W|BPF_ABS
            assert k % 4 == 0 and k + 4 <= len(data), f"load out of seccomp_data at {k}"
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x54:  # BPF_ALU|BPF_AND|BPF_K
            acc &= k
        elif code in (0x15, 0x25, 0x35, 0x45):  # JEQ, JGT, JGE, JSET
            taken = {0x15: acc == k, 0x25: acc > k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        elif code == 0x05:  # BPF_JMP|BPF_JA
            pc += k
        elif code == 0x06:  # BPF_RET|BPF_K
            if k == ALLOW:
                return ("allow",), steps
            if k == KILL:
                return ("kill",), steps
            assert k & 0xFFFF0000 == ERRNO, hex(k)
            return ("errno", k & 0xFFFF), steps
        else:
            raise AssertionError(f"unknown BPF instruction {code:#x}")
        assert pc < len(ins), "jumped past the end of the program"
