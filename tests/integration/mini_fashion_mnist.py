#!/usr/bin/python3
"""mini_fashion_mnist.py: writes a small Fashion-MNIST into a directory,
the first TRAIN training and TEST test images of the real one under the
real file names, so that a test can point STARLING_FASHION_MNIST_DIR (and
anything that reads that directory) at it and train and evaluate in a
fraction of a second.

Usage: /usr/bin/python3 mini_fashion_mnist.py OUT_DIR [TRAIN [TEST]]
(defaults 3000 and 1000). Reads $STARLING_FASHION_MNIST_DIR or
/usr/share/datasets/fashion-mnist; exits 1 with a message when it is
missing.
"""
import gzip
import os
import sys


def subset(src, dst, count, header):
    with gzip.open(src, "rb") as f:  # only the part that is kept is inflated
        head = bytearray(f.read(header))
        item = 1
        for i in range(8, header, 4):  # the dimensions after the count
            item *= int.from_bytes(head[i:i + 4], "big")
        body = f.read(count * item)
    head[4:8] = count.to_bytes(4, "big")  # the item count, big-endian
    with gzip.open(dst, "wb", compresslevel=1) as f:
        f.write(bytes(head) + body)


def main(argv):
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    out = argv[1]
    n_train = int(argv[2]) if len(argv) > 2 else 3000
    n_test = int(argv[3]) if len(argv) > 3 else 1000
    src = os.environ.get("STARLING_FASHION_MNIST_DIR",
                         "/usr/share/datasets/fashion-mnist")
    os.makedirs(out, exist_ok=True)
    files = [("train-images-idx3-ubyte.gz", n_train, 16),
             ("train-labels-idx1-ubyte.gz", n_train, 8),
             ("t10k-images-idx3-ubyte.gz", n_test, 16),
             ("t10k-labels-idx1-ubyte.gz", n_test, 8)]
    for name, count, header in files:
        path = os.path.join(src, name)
        if not os.path.exists(path):
            sys.stderr.write("mini_fashion_mnist: %s is missing: apt-get "
                             "install dataset-fashion-mnist\n" % path)
            return 1
        subset(path, os.path.join(out, name), count, header)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
