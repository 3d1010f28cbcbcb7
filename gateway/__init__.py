"""nfsgw: the NFSv3 gateway server."""
