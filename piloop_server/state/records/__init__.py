"""The records Redis stores, one typed class each, whose field names are written once (in their module)."""
