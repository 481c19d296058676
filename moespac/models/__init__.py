"""Model specs, loading (hub id or local folder), and locally built model pairs."""
