/* A large process forks, as the seeds' fork experiment: 32 MiB written,
 * then a child that writes an eighth of it (copy-on-write) and exits. */
#include <stddef.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096UL

int main(void)
{
	size_t len = 32UL << 20;
	volatile char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	pid_t c;

	if (p == MAP_FAILED)
		return 1;
	for (size_t i = 0; i < len; i += PAGE)
		p[i] = 1;
	c = fork();
	if (c == 0) {
		for (size_t i = 0; i < len / 8; i += PAGE)
			p[i] = 2;
		_exit(0);
	}
	if (c > 0)
		waitpid(c, NULL, 0);
	return 0;
}
