"""The web page at /ui: its routes (pages.py), logins and sessions (sessions.py), CSRF (csrf.py), static files."""
