"""OpenRLHF: the reward function file that records outcomes into a STATE."""
