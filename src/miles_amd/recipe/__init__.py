"""What to run: the recipe's typed settings, the launch plan, its inputs, the hardware."""
