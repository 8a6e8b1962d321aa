"""python -m campaigns: the paper-scale campaigns' command line (campaigns/campaign.py's main)."""
from campaigns.campaign import main
from plumbing import cli

cli.run(main)
