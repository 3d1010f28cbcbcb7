"""Operations: configuration (TOML schema, CLI), the composition root (``server``), the admin
HTTP API, metrics, logging and systemd integration. Nothing here speaks NFS on the wire;
everything here may import the layers below it, never the other way round.
"""
