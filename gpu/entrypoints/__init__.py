"""Ways into the engine from outside the process: `openai/`, an OpenAI-compatible HTTP server."""
