"""What a release is made of: recipes, the scheduler, packages, model cards, the kit's host side, publish and the
checks every family shares."""
