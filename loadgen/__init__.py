"""nfsgw-loadgen: ImageNet-epoch load generator."""
