"""Operations: configuration (TOML schema, CLI), the composition root (``build`` constructs
the parts, ``server`` runs their life cycle), the admin HTTP API, metrics, logging and systemd
integration. Nothing here speaks NFS on the wire;
everything here may import the layers below it, never the other way round.
"""
