"""The engine core in a process of its own, and the one client class that talks to it.

Why: in one interpreter, the app's UI thread holds the GIL that each engine step needs for its
Python (scheduling, staging, output processing); measured on an H100, 8 tabs streamed at
646-674 tok/s where the engine alone gave 2,622. As vLLM V1 does with its EngineCore, the step
loop runs in a spawned process (`core.py`) and the app, `tinychat generate` and library
streaming talk to it through `EngineCoreClient` (`client.py`), which keeps EngineThread's
contract (add_request with an on_output callback, abort, stats, shutdown).

Transport and encoding: a socket pair read and written as multiprocessing Connections, tuples
pickled with pickle.dumps (protocol.py), requests named by int handles. Measured with
`python -m gpu.bench.engine_core_transport` on the 2-core CPU machine (busy: load 9-24), one
STEP message per engine step:

| | 8 requests | 256 requests |
|---|---|---|
| socket pair + pickle, flat out | 48-51k msg/s (20 us each) | 11-12k msg/s (85-92 us) |
| pyzmq ipc + msgspec, flat out | 117-305k msg/s (3-9 us) | 18-21k msg/s (47-57 us) |
| the core's cost per message at one step a ms, pickle | 20-22 us | 41-43 us |
| the same, zmq + msgspec | 29-32 us | 28-50 us |

zmq + msgspec wins flat out, but the core sends one message a step, and at that pace its cost
in the core (what the step loop pays) is the same or higher than the socket pair's: 2% of a 1 ms
GPU decode step at 8 requests. The standard library needs no package on the GPU machine (which
cannot install one). Int handles and flat lists: 18 us to pickle and unpickle a 256-request
step, 119 us as (request id, token ids) tuples; plain pickle.dumps instead of Connection.send's
ForkingPickler: 1.7 vs 6.3 us at 8 requests.

Measured through the default model on the same CPU, batch 1, 128 greedy tokens, both engines
in one run, alternating (a `tinychat generate`-like loop; load 8-10 from other work): the client
14.9-19.9 tok/s against the in-process engine thread's 13.1-14.2 (medians 17.1 and 13.7); with
one BLAS thread, 10.0-11.3 and 9.7-12.0. The boundary costs less than the machine's noise.

Detokenizing and stop strings run in the client (request_state.py): 2-3 us a token is ~0.5-0.8
ms a step at 256 requests that would sit in the core's loop.
"""

from gpu.engine_core.client import EngineCoreClient, EngineCoreError

__all__ = ["EngineCoreClient", "EngineCoreError"]
