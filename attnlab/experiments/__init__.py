"""Small, complete experiments from the lectures."""
