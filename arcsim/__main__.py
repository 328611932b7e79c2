from arcsim.cli import main

main()
