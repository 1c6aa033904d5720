"""The pure authentication library (ddprun_rdzv_state) does no I/O and carries no cryptography
of its own: it calls no function that opens or reads a file, loads a library or draws random
bytes (those are ddprun_rdzv_io's), and its SHA-256 and HMAC are libcrypto's.

usage: pure_auth_symbols.py LIBRARY.a
"""
import subprocess
import sys

IO = {"getrandom", "open", "open64", "openat", "read", "fstat", "fstat64", "stat", "fopen", "dlopen", "dlsym",
      "RAND_bytes", "RAND_priv_bytes", "geteuid"}
LIBCRYPTO = {"EVP_MAC_init", "EVP_Digest", "CRYPTO_memcmp"}


def main():
    lib = sys.argv[1]
    undefined = set(subprocess.run(["nm", "-u", "--format=just-symbols", lib], capture_output=True, text=True,
                                   check=True).stdout.split())
    defined = subprocess.run(["nm", "-C", "--defined-only", "--format=just-symbols", lib], capture_output=True,
                             text=True, check=True).stdout.split("\n")
    bad = sorted(s for s in undefined if s.split("@")[0] in IO)
    own = sorted(s for s in defined if "rdzv::Sha256::" in s or "sha_ni" in s or "block_sha" in s)
    missing = sorted(LIBCRYPTO - {s.split("@")[0] for s in undefined})
    ok = True
    if bad:
        print(f"FAIL: {lib} calls I/O functions: {', '.join(bad)} (move them to ddprun_rdzv_io)")
        ok = False
    if own:
        print(f"FAIL: {lib} defines its own SHA-256: {', '.join(own[:5])}")
        ok = False
    if missing:
        print(f"FAIL: {lib} does not call libcrypto's {', '.join(missing)}")
        ok = False
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
