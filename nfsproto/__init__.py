"""nfsgw wire protocols: XDR, ONC RPC, NFSv3, MOUNTv3, PORTMAPv2. Sans-I/O."""
