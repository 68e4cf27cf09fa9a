"""fuzz/corpus/libdhs_seeds.py: writes the structured seeds of fuzz/libdhs_fuzz.cc into fuzz/corpus/libdhs/ (run from
the repository root; names are the SHA-1 of the content). Each seed is a call sequence in the target's encoding that
reaches the success paths (granted requests, appends, resolves, hold / commit, complete) that random bytes rarely
reach; libFuzzer mutates from there. Re-run after changing the target's encoding."""
import hashlib
import os

SUBMIT, POLL, APPEND, RESOLVE, READERS, HOLD, COMMIT, COMPLETE, STATS = 0, 1, 2, 3, 4, 5, 6, 7, 8
GRANTED0 = [1, 0]      # PickRequest: the first granted request (needs a grant seen)
GRANTED1 = [1, 1]      # ... the second


def submit(input_rows, extra):
    return [SUBMIT, input_rows - 1, extra, 1, 1, 1, 1, 1]


def poll_wait():
    return [POLL, 8, 1, 1]  # capacity 8, count given, wait for an event (up to 20 ms)


def append(req, count, keys=True):
    return [APPEND] + req + [1, count, 1, 1, 1 if keys else 0, 1, 1] + ([] if keys else [0])


def resolve(reqs_sels, source=0):
    out = [RESOLVE, 1, 1, source, 1, source, len(reqs_sels)]
    for req, sel in reqs_sels:
        out += req + [1, len(sel)] + [t + 1 for t in sel] + [1, 1]
    return out + [1]


def readers(source=0):
    return [READERS, source, 1, 1]


def seeds():
    a = submit(40, 20) + poll_wait() + append(GRANTED0, 20) + resolve([(GRANTED0, [0, 5, 19, 3, 7, 11, 2, 1])])
    a += readers() + [HOLD] + GRANTED0 + [1] + append(GRANTED0, 3) + [COMMIT] + GRANTED0 + [1]
    a += append(GRANTED0, 1) + resolve([(GRANTED0, [21, 20, 4, -1])], 1) + readers(1) + [COMPLETE] + GRANTED0
    a += [STATS, 1]
    b = submit(64, 16) + submit(48, 16) + poll_wait() + poll_wait() + append(GRANTED0, 39) + append(GRANTED1, 30)
    b += resolve([(GRANTED0, [0, 1, 2, 3, 30, 31, 38, 17]), (GRANTED1, [29, 0, 14, 15, 16, -1, -1, -1])])
    b += readers() + poll_wait() + append(GRANTED0, 25, keys=False) + resolve([(GRANTED0, [40, 2, 60, 33])], 1)
    b += readers(1) + submit(30, 10) + poll_wait() + [COMPLETE] + GRANTED1 + poll_wait() + poll_wait()
    b += [10, 1, 1, 0, 1, 0, 1, 1]  # list resumable, then an import of a request that is no resume
    c = submit(20, 30) + poll_wait() + append(GRANTED0, 20) + [HOLD] + GRANTED0 + [1] + append(GRANTED0, 39)
    c += append(GRANTED0, 5) + [COMMIT] + GRANTED0 + [3] + resolve([(GRANTED0, [0, 21, 22, 23, 24, 9])])
    c += readers() + [12] + [9] * 6 + [COMPLETE] + GRANTED0
    return [a, b, c]


def main():
    d = os.path.join("fuzz", "corpus", "libdhs")
    for s in seeds():
        data = bytes(x & 0xff for x in s)
        with open(os.path.join(d, hashlib.sha1(data).hexdigest()), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
