"""`tinychat serve`: an OpenAI-compatible HTTP server on the engine (vLLM's layout).

protocol.py           the request bodies (pydantic) and the OpenAI-shaped errors
async_engine.py       the engine client seen from asyncio: one async stream per request
serving.py            what chat and completions share: sampling params, limits, usage
serving_chat.py       POST /v1/chat/completions
serving_completion.py POST /v1/completions
metrics.py            GET /metrics (Prometheus text)
api_server.py         the Starlette app, the API key, uvicorn, and `tinychat serve`
"""
