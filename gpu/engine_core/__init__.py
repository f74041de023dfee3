"""The engine core in a process of its own, and the one client class that talks to it.

Why: in one interpreter, the app's UI thread holds the GIL that each engine step needs for its
Python (scheduling, staging, output processing); measured on an H100, 8 tabs streamed at
646-674 tok/s where the engine alone gave 2,622. As vLLM V1 does with its EngineCore, the step
loop runs in a spawned process (`core.py`) and the app, `tinychat generate` and library
streaming talk to it through `EngineCoreClient` (`client.py`), which keeps EngineThread's
contract (add_request with an on_output callback, abort, stats, shutdown).

Transport and encoding: a socket pair read and written as multiprocessing Connections, pickled
tuples (protocol.py), requests named by int handles. Measured with
`python -m gpu.bench.engine_core_transport` on the 2-core CPU machine (busy: load 13-24), one
STEP message per engine step, 8 and 256 requests:

| | 8 requests | 256 requests |
|---|---|---|
| Pipe + pickle, flat out | 27-33k msg/s (30-37 us) | 9-12k msg/s (85-111 us) |
| pyzmq ipc + msgspec, flat out | 60-117k msg/s (9-17 us) | 13-27k msg/s (36-75 us) |
| the core's cost per message, one step a ms | 42 us (either) | 65 (pipe) / 34 (zmq) us |
| pickle dumps + loads alone | 2-8 us | 18-55 us |

pyzmq + msgspec wins flat out, by less when the core sends one message a step as it does; the
core's cost is a few percent of a 1 ms GPU step either way, and the stdlib needs no package on
the GPU machine (which cannot install one). So: the standard library. Int handles and flat
lists halve the pickling against (request id, token ids) tuples (18 vs 119 us at 256).

Detokenizing and stop strings run in the client (request_state.py): ~4-6 us a token is ~1 ms a
step at 256 requests that would sit in the core's loop.
"""

from gpu.engine_core.client import EngineCoreClient, EngineCoreError

__all__ = ["EngineCoreClient", "EngineCoreError"]
