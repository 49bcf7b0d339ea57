"""CPU harness that compiles the Metal kernel bodies with g++ and runs them."""
