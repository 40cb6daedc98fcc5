from kdg.cli import main

main()
