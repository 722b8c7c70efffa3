// A NestJS app as `nest new` lays it out (a controller, a module, a bootstrap), in one
// file: Nest's scaffold listens on `process.env.PORT ?? 3000`.
import { NestFactory } from '@nestjs/core';
import { Controller, Get, Module } from '@nestjs/common';

@Controller()
class AppController {
  @Get()
  getHello(): string {
    return `Hello from Nest (pid ${process.pid})\n`;
  }
}

@Module({ controllers: [AppController] })
class AppModule {}

async function bootstrap() {
  const app = await NestFactory.create(AppModule);
  await app.listen(process.env.PORT ?? 3000);
}
bootstrap();
