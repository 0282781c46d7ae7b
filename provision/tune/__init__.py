"""`rocmdoctor tune`: the search over the server's batch settings (pure, on a measured curve), the
workload it measures with, the runner that restarts the server for each point and stops it on every
exit path, the record of known points, and the write-back of the winner as one change."""
