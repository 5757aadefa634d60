"""Model quality: reference sets, and optimised variants judged on them."""
