"""The API's routers, one per file."""
