"""A target with known function names for the stack tests (standard library only).

stdin commands: ``grow MIB`` (``hold_memory`` allocates and holds MIB, replies "ok grow"),
``exit``. ``hold_memory`` then waits for the next command inside itself, so a stack taken
after the growth has it as the innermost frame.
"""

import sys

MiB = 1024 * 1024
held = []


def wait_for_command():
    return sys.stdin.readline().split()


def hold_memory(mib):
    # A MiB at a time, with some work on each (~3 ms a MiB): the memory rises while the
    # daemon's stacks are read, as real code's does.
    for _ in range(mib):
        held.append(bytearray(b"\x01") * MiB)
        sum(range(30000))
    sys.stdout.write("ok grow\n")
    sys.stdout.flush()
    # Wait for the next command right here (in C, no deeper Python frame), as a model
    # holding its weights sits in its serving loop.
    return handle(sys.stdin.readline().split())


def handle(cmd):
    if not cmd or cmd[0] == "exit":
        return
    if cmd[0] == "grow":
        return hold_memory(int(cmd[1]))


def serve():
    return handle(wait_for_command())


if __name__ == "__main__":
    sys.stdout.write(f"ok ready {__import__('os').getpid()}\n")
    sys.stdout.flush()
    serve()
