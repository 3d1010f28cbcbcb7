"""Packed datasets: ``nfsgw pack`` writes a prefix's objects into large tar shards
plus an index (``format``, ``packer``); an export with ``pack = ...`` serves every object
whose key and ETag match the index from its shard (``store``), the rest from its own object.
"""
