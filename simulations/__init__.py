"""simulations."""
