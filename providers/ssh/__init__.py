"""The ssh provider: machines you already have (a lab, a workstation pool), reached over SSH.

Prerequisites: key-based SSH to every host, their host keys in your known_hosts (never trusted
on first use), and a Python with torch and cloudtrain on each (``--python``). It creates and
deletes no machine: `up` connects, records facts and checks each host with the bootstrap's
check-only phases; `down` stops cloudtrain's processes and removes its files.
"""
