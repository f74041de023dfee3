"""How fast can the engine core's step outputs cross the process boundary? (a script, not a test)

    python -m gpu.bench.engine_core_transport [--steps N]

Sends one message per engine step, the STEP message the core sends (gpu/engine_core/protocol.py:
int handles and new token ids as two flat lists, a stats tuple), from a spawned process to this
one, for 8 and 256 requests, over:
  - multiprocessing.Pipe + pickle.dumps (the standard library, as the core sends), and
  - pyzmq PUSH/PULL over ipc:// + msgspec (vLLM's choice), when both are importable,
and prints messages/s and microseconds per step message. It also times the incremental
detokenizer per token on the default model's tokenizer, the cost that would sit in the core's
step loop if the core detokenized. The figures are in gpu/engine_core/__init__.py's docstring.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import pickle
import time

PACE = 0.001  # seconds between step messages for the sender's cost (a GPU decode step)
STATS = (3, 0, 120, 4096, 1000, 900, 0, 812.5, (8, 0, 8, 0.0011))


def _step_message(n: int, step: int) -> tuple:
    tokens = [1000 + (step + i) % 40000 for i in range(n)]
    return ("step", list(range(n)), tokens, [], STATS)


def _messages(n: int, steps: int) -> list[tuple]:
    """Built before the clock starts: the receiver times the transport, not the sender."""
    return [_step_message(n, s) for s in range(steps)]


def _pipe_sender(conn, n: int, steps: int, pace: float) -> None:
    messages = _messages(n, steps)
    spent = 0.0
    for message in messages:
        t0 = time.perf_counter()
        conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        spent += time.perf_counter() - t0
        if pace:
            time.sleep(pace)  # a step's work: the receiver keeps up, as it does in the app
    conn.send_bytes(pickle.dumps(spent / steps))  # the core's cost: encode + write
    conn.send_bytes(pickle.dumps(None))
    conn.close()


def _zmq_sender(addr: str, n: int, steps: int, pace: float) -> None:
    import msgspec
    import zmq

    sock = zmq.Context().socket(zmq.PUSH)
    sock.connect(addr)
    enc = msgspec.msgpack.Encoder()
    messages = _messages(n, steps)
    spent = 0.0
    for message in messages:
        t0 = time.perf_counter()
        sock.send(enc.encode(message), copy=False)
        spent += time.perf_counter() - t0
        if pace:
            time.sleep(pace)
    sock.send(enc.encode(spent / steps))
    sock.send(enc.encode(None))
    sock.close(linger=1000)


def measure_pipe(n: int, steps: int, pace: float = 0.0) -> tuple[float, float]:
    """(receiver's seconds per message, sender's seconds per message); pace: seconds the
    sender sleeps after each message (0: as fast as it can, a throughput test)"""
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_pipe_sender, args=(send, n, steps, pace))
    proc.start()
    send.close()
    pickle.loads(recv.recv_bytes())
    t0 = time.perf_counter()
    last = None
    count = 0
    while (message := pickle.loads(recv.recv_bytes())) is not None:
        last = message
        count += 1
    dt = time.perf_counter() - t0
    proc.join()
    return dt / max(count - 1, 1), float(last)


def measure_zmq(n: int, steps: int, pace: float = 0.0) -> tuple[float, float]:
    import msgspec
    import zmq

    addr = f"ipc:///tmp/tinychat-transport-{time.time_ns()}"
    sock = zmq.Context().socket(zmq.PULL)
    sock.bind(addr)
    dec = msgspec.msgpack.Decoder()
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=_zmq_sender, args=(addr, n, steps, pace))
    proc.start()
    dec.decode(sock.recv())
    t0 = time.perf_counter()
    last = None
    count = 0
    while (message := dec.decode(sock.recv())) is not None:
        last = message
        count += 1
    dt = time.perf_counter() - t0
    proc.join()
    sock.close()
    return dt / max(count - 1, 1), float(last)


def measure_encode(n: int, reps: int = 2000) -> float:
    msg = _step_message(n, 7)
    t0 = time.perf_counter()
    for _ in range(reps):
        pickle.loads(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
    return (time.perf_counter() - t0) / reps


def measure_detokenize(tokens: int = 4000) -> float | None:
    try:
        from weights import IncrementalDetokenizer, Tokenizer, resolve_model
    except ImportError:
        return None
    tok = Tokenizer.from_folder(resolve_model(None))
    ids = tok.encode("The quick brown fox jumps over the lazy dog. " * 400)[:tokens]
    detok = IncrementalDetokenizer(tok)
    t0 = time.perf_counter()
    for i in ids:
        detok.add(i)
    return (time.perf_counter() - t0) / len(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    args = parser.parse_args()
    for n in (8, 256):
        steps = args.steps if n == 8 else max(args.steps // 4, 100)
        for name, measure in (("pipe+pickle", measure_pipe), ("zmq+msgspec", measure_zmq)):
            try:
                per, _ = measure(n, steps)
                _, send = measure(n, min(steps, 1000), PACE)
            except ImportError:
                print(f"{name}: not installed")
                continue
            print(
                f"{name}  {n:4d} requests: {1 / per:9,.0f} msg/s  {per * 1e6:7.1f} us/step "
                f"received flat out; {send * 1e6:6.1f} us/step in the sender (the core) "
                f"one step every {PACE * 1e3:.0f} ms"
            )
        enc = measure_encode(n)
        print(f"pickle dumps+loads alone, {n} requests: {enc * 1e6:.1f} us")
    detok = measure_detokenize()
    if detok is not None:
        print(f"incremental detokenizer: {detok * 1e6:.1f} us/token")


if __name__ == "__main__":
    main()
